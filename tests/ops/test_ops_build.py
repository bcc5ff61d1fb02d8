"""CPU + nvcc: the CUDA sources compile (for every arch in TORCH_CUDA_ARCH_LIST), the ops register with
the schemas we document, and the fake implementations give the shapes/dtypes the references give."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ltxbench.errors import BuildError
from ltxbench.ops import build
from ltxbench.ops.registry import DTYPES, SPECS

ROOT = Path(__file__).resolve().parents[2]


TORCH_INCLUDE = re.compile(r"#include\s*[<\"](torch|ATen|c10)/")


def test_only_the_bindings_include_torch_headers():
    bindings = ROOT / "cuda" / "bindings"
    for src in sorted((ROOT / "cuda").rglob("*")):
        if src.is_file() and src.parent != bindings:
            assert not TORCH_INCLUDE.search(src.read_text()), src
    assert any(TORCH_INCLUDE.search(p.read_text()) for p in bindings.glob("*.cpp"))  # the check above is not empty


def test_each_bindings_file_takes_the_light_torch_headers_first():
    """checks.h, included first, defines TORCH_ASSERT_ONLY_METHOD_OPERATORS: the per-op ATen headers, not the
    whole of ATen (seconds more of parsing)."""
    for src in sorted((ROOT / "cuda" / "bindings").glob("*.cpp")):
        if src.name == "source_use.cpp":  # plain C++, no torch: the provenance record's reader
            continue
        includes = re.findall(r"^#include\s*([<\"][^>\"]+[>\"])", src.read_text(), re.M)
        assert includes[0] == '"bindings/checks.h"', src
        assert not {"<ATen/ATen.h>", "<torch/extension.h>", "<torch/all.h>"} & set(includes), src
    assert "#define TORCH_ASSERT_ONLY_METHOD_OPERATORS" in (ROOT / "cuda" / "bindings" / "checks.h").read_text()


def test_the_checkouts_sources_are_found_and_the_override_still_works(monkeypatch, tmp_path):
    assert Path(str(build.SOURCES_DIR)) == ROOT / "cuda"
    found = [p.relative_to(ROOT / "cuda").as_posix() for p in build.sources(build.SOURCES_DIR)]
    bindings = sorted(f"bindings/{p.name}" for p in (ROOT / "cuda" / "bindings").glob("*.cpp"))
    assert found[: len(bindings) + 1] == [*bindings, "gemm.cpp"]  # the host-only gemm.cpp too, for g++
    assert {"bindings/norm.cpp", "norm.cu", "rope_3d.cu", "rope_split.cu", "rope_1d.cu"} <= set(found)
    assert not any(name.startswith("common/") for name in found)  # headers are not compiled alone
    monkeypatch.setenv("LTXBENCH_CUDA_SRC", str(tmp_path))
    assert build._sources_dir() == tmp_path
    with pytest.raises(BuildError, match=f"CUDA sources not found under {tmp_path} \\(from LTXBENCH_CUDA_SRC\\)"):
        build.sources(tmp_path)


def test_the_bindings_are_compiled_as_one_unit_rewritten_only_when_it_changes(tmp_path):
    """torch's headers are parsed once for all the bindings files; an unchanged unit keeps its mtime (else ninja
    would rebuild it at every load)."""
    units = build._translation_units(build.SOURCES_DIR, tmp_path)
    bindings = sorted((ROOT / "cuda" / "bindings").glob("*.cpp"))
    assert units[0] == tmp_path / build.BINDINGS_UNIT and not set(bindings) & set(units)
    assert units[1:] == [s for s in build.sources(build.SOURCES_DIR) if s not in bindings]
    assert units[0].read_text().splitlines() == [f'#include "{p}"' for p in bindings]
    stamp = units[0].stat().st_mtime_ns
    build._translation_units(build.SOURCES_DIR, tmp_path)
    assert units[0].stat().st_mtime_ns == stamp


@pytest.mark.skipif(torch.cuda.is_available() or not shutil.which("nvcc"), reason="checks the no-GPU build's log")
def test_no_cuda_runtime_warning_on_a_cpu_build(tmp_path):
    """cpp_extension warns "No CUDA runtime is found" on import without a GPU: noise where the CPU build is the
    point (and it named nvcc's grandparent, /usr/local, while `env` shows the toolkit the build uses)."""
    code = "import ltxbench.ops.build as b; import torch.utils.cpp_extension; b._check_toolchain()"
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert "No CUDA runtime is found" not in proc.stderr, proc.stderr


def test_build_module_is_the_only_caller_of_cpp_extension_load():
    callers = [p for p in (ROOT / "ltxbench").rglob("*.py") if "cpp_extension" in p.read_text()]
    assert callers == [ROOT / "ltxbench" / "ops" / "build.py"]


def test_every_spec_is_a_registered_op_with_fake(built_ops):
    assert Path(built_ops["path"]).is_file()
    for name in SPECS:
        op = getattr(torch.ops.ltxbench, name)
        assert op.default._schema.name == f"ltxbench::{name}"
    assert build.build_status()["built"] is True


def test_fused_add_schema_is_functional(built_ops):
    # Nothing is updated in place, so no argument carries an alias annotation.
    schema = str(torch.ops.ltxbench.fused_add_rms_norm.default._schema)
    assert "!" not in schema and schema.endswith("-> (Tensor, Tensor)")


def _strides(t):
    return [st for st, n in zip(t.stride(), t.shape, strict=True) if n > 1]


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_fake_outputs_match_reference_shapes(built_ops, name, dtype):
    spec = SPECS[name]
    for variant in spec.variants:
        for shape in (spec.test_shapes[1], (1, 3, 2048), (0, 4, 64)):
            real = spec.make_inputs(shape, DTYPES[dtype], "cpu", torch.Generator().manual_seed(0), variant)
            expected = spec.reference(**real)
            expected = expected if isinstance(expected, tuple) else (expected,)
            with FakeTensorMode():  # same shapes and strides as the real inputs, on a "cuda" that needs no GPU
                fake = {k: (torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="cuda")
                            if isinstance(v, torch.Tensor) else v) for k, v in real.items()}
                got = spec.fn(**fake)
            got = got if isinstance(got, tuple) else (got,)
            assert len(got) == len(expected) == spec.n_outputs
            for g, e in zip(got, expected, strict=True):
                assert g.device.type == "cuda"
                assert (g.shape, g.dtype) == (e.shape, e.dtype), (variant, shape)
                # same memory layout (contiguous; rope_1d token-major); a size-1 dim's stride is arbitrary, and so
                # is every stride of an empty tensor (torch keeps a view's strides where .contiguous() has no copy)
                assert _strides(g) == _strides(e) or not e.numel(), (variant, shape)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_cpu_tensors_get_a_clear_error_naming_the_argument(built_ops, name):
    spec = SPECS[name]
    inputs = spec.make_inputs((1, 2, 8), torch.float32, "cpu", torch.Generator().manual_seed(0), spec.variants[0])
    first = next(iter(inputs))
    with pytest.raises(RuntimeError, match=rf"ltxbench\.{name}: {first} must be a CUDA tensor"):
        spec.fn(**inputs)


def test_missing_nvcc_is_a_build_error_with_a_hint(monkeypatch):
    from torch.utils import cpp_extension

    monkeypatch.setattr(build, "_loaded", None)
    monkeypatch.setattr(build, "_guess_cuda_home", lambda: None)  # no toolkit on disk
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    with pytest.raises(BuildError) as err:
        build.load()
    assert err.value.exit_code == 4 and "nvcc" in err.value.message and "CUDA_HOME" in err.value.hint


def test_missing_cublaslt_is_a_build_error_with_a_hint(monkeypatch, tmp_path):
    import nvidia

    monkeypatch.setenv("CUDA_HOME", str(tmp_path))  # a "toolkit" without cuBLAS
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(nvidia, "__path__", [str(tmp_path / "no-wheels")])
    (tmp_path / "no-wheels").mkdir()
    with pytest.raises(BuildError) as err:
        build._cublaslt(tmp_path)
    assert err.value.exit_code == 4 and "cuBLASLt" in err.value.message and "nvidia-cublas" in err.value.hint


def test_cublaslt_headers_are_taken_alone_not_the_wheels_cuda_runtime(tmp_path):
    includes, ldflags = build._cublaslt(tmp_path)
    assert sorted(p.name for p in Path(includes[0]).iterdir()) == ["cublasLt.h", "cublas_api.h"]
    assert any(f.startswith("-l:libcublasLt.so") for f in ldflags) and any("rpath" in f for f in ldflags)
    stamps = [p.stat().st_mtime_ns for p in sorted(Path(includes[0]).iterdir())]
    build._cublaslt(tmp_path)  # the next process's load: same headers, untouched (else ninja rebuilds gemm.cpp)
    assert [p.stat().st_mtime_ns for p in sorted(Path(includes[0]).iterdir())] == stamps


def test_gemm_settings_ops_without_a_gpu(built_ops):
    from ltxbench import ops

    previous = ops.gemm_tuning(False)
    try:
        assert ops.gemm_tuning(False) is False and ops.gemm_choices() == []  # nothing ran on this machine
    finally:
        ops.gemm_tuning(previous)
    assert torch.ops.ltxbench.gemm_export(0) == []
    with pytest.raises(RuntimeError, match="gemm_import: device must be a CUDA device index, got 0"):
        torch.ops.ltxbench.gemm_import(0, ["ltxgemm2 1"])  # no GPU here: no device 0


def test_build_after_torch_compile_finds_the_toolkit(monkeypatch):
    """inductor can import cpp_extension before our first build, freezing its CUDA_HOME at nvcc's grandparent
    guess (/usr/local for a /usr/local/bin/nvcc link, without CUDA headers): the build must correct it."""
    from torch.utils import cpp_extension

    home = build.cuda_home()
    if home is None:
        pytest.skip("no CUDA toolkit")
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", "/nonexistent-cuda")
    build._check_toolchain()
    assert cpp_extension.CUDA_HOME == home


@pytest.mark.slow  # a second build of every source, in its own folder
def test_compiler_error_is_reported_with_its_output(monkeypatch, tmp_path):
    if not (shutil.which("nvcc") or build.cuda_home()):
        pytest.skip("no nvcc")
    src = tmp_path / "cuda"
    shutil.copytree(ROOT / "cuda", src)
    (src / "broken.cu").write_text("this is not CUDA;\n")
    monkeypatch.setattr(build, "_loaded", None)
    monkeypatch.setattr(build, "SOURCES_DIR", src)
    monkeypatch.setenv("LTXBENCH_CACHE", str(tmp_path / "build"))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    with pytest.raises(BuildError) as err:
        build.load()
    assert "broken.cu" in err.value.message and "TORCH_CUDA_ARCH_LIST" in err.value.hint


def test_every_op_gets_an_explicit_inductor_fallback(built_ops):
    """Inductor must never take its implicit-fallback path for our ops (torch 2.11 formats the whole IR graph
    there: compiling the patched 28-block LTX model did not finish)."""
    from torch._inductor import lowering

    from ltxbench import ops

    ops.register_inductor_fallbacks()
    names = {n.partition("::")[2].partition(".")[0] for n in torch._C._dispatch_get_all_op_names()
             if n.startswith("ltxbench::")}
    assert {"rms_norm", "qk_rms_norm_rope", "add_rms_norm_modulate", "linear_gelu_tanh", "linear"} <= names
    settings = {"gemm_tuning", "gemm_choices", "gemm_export", "gemm_import"}  # no tensors: never in a graph
    # ops that only write into the tensors they are given (no returns): inductor runs them through
    # auto_functionalized, which needs no lowering of its own
    into = {"qk_rms_norm_rope_pack_into", "qk_rms_norm_rope_split_pack_into"}
    for name in names - settings - into:
        assert getattr(torch.ops.ltxbench, name).default in lowering.lowerings, name
    for name in into:
        assert getattr(torch.ops.ltxbench, name).default._schema.arguments[-1].alias_info.is_write, name
    for name in settings:
        assert getattr(torch.ops.ltxbench, name).default not in lowering.lowerings, name
    assert ops.register_inductor_fallbacks() == 0  # idempotent


def test_each_variants_widest_row_is_the_one_the_binding_refuses_beyond():
    """KernelSpec.max_width (read by the GPU tests and the Wan rules) and the CUDA limit are the same number."""
    from ltxbench.ops.registry import F32_MODULATION_WIDTH

    params = (Path(__file__).parents[2] / "cuda" / "common" / "params.h").read_text()
    limit = int(re.search(r"kMaxF32ModulationRow = (\d+);", params).group(1))
    assert set(F32_MODULATION_WIDTH.values()) == {limit}
    spec = SPECS["gated_residual"]
    bf16, fp32 = torch.bfloat16, torch.float32
    assert spec.takes("wan-f32", (1, 2, limit), bf16) and not spec.takes("wan-f32", (1, 2, limit + 8), bf16)
    assert spec.takes("wan-f32", (1, 2, limit + 8), fp32)  # float32 rows: the general path
    assert spec.takes("per-batch", (1, 2, 10 * limit), bf16) and spec.takes("wan-f32", (), bf16)


def _declared_entries() -> set[str]:
    """The functions one file declares for another to call (common/params.h, common/row_math.cuh; a binding file may
    declare the one kernel entry it alone calls), inline ones and constants aside."""
    names = set()
    for header in ("params.h", "row_math.cuh"):
        text = (ROOT / "cuda" / "common" / header).read_text()
        for line in (line.split("//")[0] for line in text.splitlines()):
            match = re.match(r"^(?!inline|constexpr|template|struct|enum|using|static|return)[A-Za-z][\w:<>*& ]*?"
                             r"[ *&](\w+)\(", line)
            if match and line.rstrip().endswith((";", ",")):
                names.add(match.group(1))
    for path in (ROOT / "cuda" / "bindings").glob("*.cpp"):  # a declaration: its parameter list ends in ';', no body
        names |= set(re.findall(r"^(?!inline|static|return)[A-Za-z][\w:<>*& ]*?[ *&](\w+)\([^;{}()]*\);",
                                path.read_text(), re.M))
    return names


def test_every_kernel_file_entry_records_that_the_process_entered_the_file():
    """Each function another file calls is defined in a kernel file (cuda/*.cu, cuda/*.cpp) whose body starts with
    NOTE_SOURCE_USED(): a result's provenance names the kernel files it ran from that record, so an entry
    without it would leave a result 'current' after a change to code it did run."""
    entries = _declared_entries()
    assert {"launch_row_op", "launch_gemv", "gemv_takes", "launch_gemm", "gemm_set_tuning",
            "try_launch_row_op_lean", "launch_norm_gemv"} <= entries
    found = set()
    for path in [*sorted((ROOT / "cuda").glob("*.cu")), *sorted((ROOT / "cuda").glob("*.cpp"))]:
        text = path.read_text()
        for match in re.finditer(r"^[A-Za-z][\w:<>*& ]*?[ *&](\w+)\([^;{]*\)\s*\{\n(.*)\n", text, re.M):
            if match.group(1) in entries:
                found.add(match.group(1))
                assert match.group(2).strip() == "NOTE_SOURCE_USED();", f"{path.name}: {match.group(1)}"
    assert found == entries


def test_every_op_a_binding_file_registers_records_that_the_process_entered_the_file():
    """Each op entry point a binding file registers (m.impl / m.def with a function) starts with NOTE_SOURCE_USED():
    a result names the binding files its run called into, so a later change to another op's binding leaves it
    current; an entry without the marker would hide a change to code the run did call. Every registration is of the
    two forms read here (a lambda or TORCH_FN would escape the check)."""
    checked = 0
    for path in sorted((ROOT / "cuda" / "bindings").glob("*.cpp")):
        text = path.read_text()
        registrations = re.findall(r"\bm\.(?:impl|def)\((.*?)\);", text, re.S)
        functions = []
        for args in registrations:
            if re.fullmatch(r'(\s*"[^"]*")+\s*', args):
                continue  # a schema alone
            target = re.fullmatch(r'(?:\s*"[^"]*")+,\s*&(?:ltxbench::)?(\w+)\s*', args)
            assert target, f"{path.name}: registration of an unrecognized form: {args!r}"
            functions.append(target.group(1))
        for name in functions:
            body = re.search(r"^[A-Za-z][\w:<>,*& ]*?[ *&]" + name + r"\([^;{}]*\)\s*\{\s*(\S+)", text, re.M)
            assert body and body.group(1) == "NOTE_SOURCE_USED();", f"{path.name}: {name}"
            checked += 1
    assert checked >= 30


def test_no_kernel_file_offers_a_function_the_entry_check_does_not_see(built_ops):
    """Every function a kernel file's object exports in namespace ltxbench (what another file can call) is one of the
    declared entries the check above holds to NOTE_SOURCE_USED(): an entry declared elsewhere would escape it."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm (binutils) to list the objects' symbols")
    entries = _declared_entries()
    objects = [o for o in Path(built_ops["build_dir"]).glob("*.o") if o.stem.split(".")[0] != "ltxbench_bindings"]
    assert len(objects) == len(list((ROOT / "cuda").glob("*.cu"))) + len(list((ROOT / "cuda").glob("*.cpp")))
    for obj in objects:
        listing = subprocess.run([nm, "-C", "--defined-only", "-g", str(obj)], capture_output=True, text=True,
                                 check=True).stdout
        exported = {m.group(1) for m in re.finditer(r" T ltxbench::(\w+)\(", listing)}
        assert exported and exported <= entries, f"{obj.name}: {sorted(exported - entries)}"


def test_the_library_reports_the_kernel_files_a_process_entered():
    """A fresh process has entered none; the GEMM settings op enters its binding file and gemm.cpp (host code, no GPU
    needed); a binding file is named with its folder."""
    script = ("from ltxbench.ops import build; import torch; build.load(); print(build.sources_used()); "
              "torch.ops.ltxbench.gemm_tuning(True); print(build.sources_used())")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split("\n")[:2] == ["[]", "['cuda/bindings/linear.cpp', 'cuda/gemm.cpp']"]
