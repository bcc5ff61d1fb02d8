"""One GEMM for several projections (inject/fuse.py): same numbers, one copy of the weights, and a fallback
whenever the layers stop sharing the fused weight."""

import pytest
import torch
import torch.nn.utils.parametrize

from ltxbench.inject.fuse import fuse_linears, fused_linear


def _layers(bias=True, outs=(6, 4, 4)):
    torch.manual_seed(0)
    return [torch.nn.Linear(5, n, bias=bias) for n in outs]


@pytest.mark.parametrize("bias", [True, False])
def test_fused_projection_equals_the_layers_and_keeps_one_copy(bias):
    layers = _layers(bias)
    x = torch.randn(3, 7, 5)
    expected = torch.cat([lin(x) for lin in layers], dim=-1)
    fused = fuse_linears(layers)
    with torch.no_grad():
        got = fused_linear(x, layers, fused)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    assert all(lin.weight.untyped_storage().data_ptr() == fused.weight.untyped_storage().data_ptr()
               for lin in layers)
    # load_state_dict copies into the views, so the fused weight follows
    state = {k: torch.randn_like(v) for k, v in layers[1].state_dict().items()}
    layers[1].load_state_dict(state)
    with torch.no_grad():
        got = fused_linear(x, layers, fused)
    torch.testing.assert_close(got[..., 6:10], x @ state["weight"].t() + (state["bias"] if bias else 0))


def test_layers_that_stop_sharing_the_weight_get_none():
    layers = _layers()
    fused = fuse_linears(layers)
    x = torch.randn(2, 5)
    with torch.no_grad():
        layers[0].double()
        assert fused_linear(x.double(), layers, fused) is None
        layers[0].float()  # back in fp32, but a separate tensor now: no longer the fused storage
        assert fused_linear(x, layers, fused) is None
    layers = _layers()
    fused = fuse_linears(layers)
    layers[2].weight = torch.nn.Parameter(torch.zeros(4, 5))
    with torch.no_grad():
        assert fused_linear(x, layers, fused) is None
    assert fused_linear(x, _layers(), None) is None
    layers = _layers()
    fused = fuse_linears(layers)
    with torch.no_grad():
        layers[1].weight.data = layers[1].weight.data.clone()  # the same Parameter, its storage moved
        assert fused_linear(x, layers, fused) is None

    class Doubled(torch.nn.Module):
        def forward(self, w):
            return 2 * w

    layers = _layers()
    fused = fuse_linears(layers)
    torch.nn.utils.parametrize.register_parametrization(layers[0], "weight", Doubled())
    with torch.no_grad():
        assert fused_linear(x, layers, fused) is None  # weight is now computed: the fused copy would ignore it


@pytest.mark.parametrize("bias", [True, False])
def test_a_moved_owner_fuses_again_and_lets_the_old_concatenation_go(bias):
    """Model CPU offload moves a module with .to(): its layers' parameters move one by one. follow_moves concatenates
    them again where they now are: the fused GEMM still runs, on one copy, and nothing holds the old concatenation
    (simulated by replacing every tensor with a copy, as a move does; then a cast to fp64 and back)."""
    import gc
    import weakref

    from ltxbench.inject import InjectionReport
    from ltxbench.inject.fuse import follow_moves

    owner = torch.nn.Module()
    layers = _layers(bias)
    for i, lin in enumerate(layers):
        owner.add_module(f"p{i}", lin)
    x = torch.randn(3, 5)
    fused = fuse_linears(layers)
    with torch.no_grad():
        expected = fused_linear(x, layers, fused)
    report = InjectionReport("owner")
    follow_moves(report, owner, fused)
    old = weakref.ref(fused.weight)
    owner._apply(lambda t: t.clone())
    gc.collect()
    assert old() is None  # the old concatenation is gone
    assert all(lin.weight.untyped_storage().data_ptr() == fused.weight.untyped_storage().data_ptr()
               for lin in layers)
    with torch.no_grad():
        torch.testing.assert_close(fused_linear(x, layers, fused), expected, rtol=0, atol=0)
        owner.double()
        torch.testing.assert_close(fused_linear(x.double(), layers, fused), expected.double(), rtol=1e-6,
                                   atol=1e-6)
        owner.float()
        assert fused_linear(x, layers, fused) is not None
    report.revert()
    assert "_apply" not in vars(owner)
    old = weakref.ref(fused.weight)
    owner._apply(lambda t: t.clone())  # after the revert a move is plain torch again: the layers leave the set
    gc.collect()
    assert fused_linear(x, layers, fused) is None and old() is None  # and the set lets its concatenation go


def test_training_needs_the_original_layers():
    layers = _layers()
    fused = fuse_linears(layers)
    assert fused_linear(torch.randn(2, 5), layers, fused) is None  # grad enabled, weights require grad


def test_layers_that_cannot_be_fused_say_why():
    assert "bias" in fuse_linears([torch.nn.Linear(5, 4), torch.nn.Linear(5, 4, bias=False)])
    assert "width" in fuse_linears([torch.nn.Linear(5, 4), torch.nn.Linear(6, 4)])
    assert "plain" in fuse_linears([torch.nn.Linear(5, 4), torch.nn.Identity()])


def test_fused_projection_compiles_without_graph_breaks():
    layers = _layers()
    fused = fuse_linears(layers)

    def project(x):
        return fused_linear(x, layers, fused) * 2

    with torch.no_grad():
        explained = torch._dynamo.explain(project)(torch.randn(4, 5))
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def test_compiled_projection_falls_back_when_a_layer_gets_a_new_parameter():
    """Compiled, the fused path reads no parameter of the layers (each would be a guard per call): a replaced one is
    seen through the registration hook's `intact` flag, which the graph guards on, and a moved model through the
    input's dtype."""
    layers = _layers()
    fused = fuse_linears(layers)
    project = torch.compile(lambda x: fused_linear(x, layers, fused), fullgraph=True, backend="eager")
    x = torch.randn(4, 5)
    with torch.no_grad():
        torch.testing.assert_close(project(x), torch.cat([lin(x) for lin in layers], dim=-1))
        assert project(x.double()) is None
        layers[2].weight = torch.nn.Parameter(torch.zeros(4, 5))
        assert not fused.intact and project(x) is None
    torch._dynamo.reset()


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_compiled_projection_does_not_read_a_weight_given_new_storage(backend):
    """`weight.data = new` keeps the Parameter and changes its storage (a user's weight swap, PEFT's safe merge). A
    compiled graph cannot compare data pointers; the view's `.data` setter ends the fusion instead, so the graph
    guards fail and the layers' own weights run. Without it, the compiled projection kept the old values."""
    layers = _layers()
    fused = fuse_linears(layers)
    project = torch.compile(lambda x: fused_linear(x, layers, fused), fullgraph=True, backend=backend)
    x = torch.randn(4, 5)
    with torch.no_grad():
        assert project(x) is not None
        swapped = torch.randn_like(layers[1].weight)
        layers[1].weight.data = swapped
        assert not fused.intact and project(x) is None
        torch.testing.assert_close(layers[1](x), x @ swapped.t() + layers[1].bias)
    torch._dynamo.reset()


def test_views_given_new_storage_let_the_concatenation_go():
    """diffusers' group offloading moves parameters with `param.data = param.data.to(device)`, not through module
    moves (follow_moves): the set stops running fused and nothing of ours keeps the old concatenation; the same
    storage assigned again (a move to where it already is) changes nothing."""
    import gc
    import weakref

    layers = _layers()
    fused = fuse_linears(layers)
    x = torch.randn(3, 5)
    with torch.no_grad():
        for lin in layers:
            lin.weight.data = lin.weight.data.to("cpu")  # already there: the same tensor
        assert fused.intact and fused_linear(x, layers, fused) is not None
        old = weakref.ref(fused.weight)
        expected = torch.cat([lin(x) for lin in layers], dim=-1)
        for lin in layers:
            for param in lin.parameters():
                param.data = param.data.clone()
        gc.collect()
        assert old() is None and fused_linear(x, layers, fused) is None
        torch.testing.assert_close(torch.cat([lin(x) for lin in layers], dim=-1), expected, rtol=0, atol=0)


def test_compiled_projection_falls_back_when_a_layer_is_replaced_in_its_parent():
    """A layer swapped for another module in its parent (setattr, as peft's LoRA wrapping does) is seen through the
    module registration hook; while no fused set has lost anything, a graph guards on one process-wide flag."""
    from ltxbench.inject import fuse

    parent = torch.nn.Module()
    parent.a, parent.b = _layers(outs=(6, 4))
    fused = fuse_linears((parent.a, parent.b))
    project = torch.compile(lambda x: fused_linear(x, (parent.a, parent.b), fused), fullgraph=True, backend="eager")
    x = torch.randn(4, 5)
    with torch.no_grad():
        assert project(x) is not None
        parent.a = parent.a  # the same module again: nothing lost
        assert fused.intact
        parent.b = torch.nn.Linear(5, 4)
        assert not fused.intact and fuse._any_broken and project(x) is None
    torch._dynamo.reset()


def test_fusing_again_after_a_revert_breaks_nothing():
    """apply, revert, apply (the e2e configurations in one process): the second fusion makes the layers' parameters
    views again, which must not count as a user's replacement (it would cost every later compiled call the per-set
    guards)."""
    from ltxbench.inject import fuse

    layers = _layers()
    first = fuse_linears(layers)
    fuse.release(first)
    before = fuse._any_broken
    second = fuse_linears(layers)
    assert first.intact and second.intact and fuse._any_broken == before
    fuse.release(second)
    layers[0].weight = torch.nn.Parameter(torch.zeros(6, 5))  # released: not watched any more
    assert second.intact
    third = fuse_linears(layers)
    fuse_linears(layers)  # fused again while `third` still stands for them: its weights are no longer theirs
    assert not third.intact


def _same(a, b) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def test_the_layers_keep_their_own_parameters_and_get_their_storage_back():
    """Fusing makes each layer's own Parameter a view of the concatenation (a reference taken before, an optimizer's,
    still reaches the layer); release gives each a plain Parameter with storage of its own again, values kept."""
    from ltxbench.inject import fuse

    layers = _layers()
    params = [p for lin in layers for p in (lin.weight, lin.bias)]
    values = [p.detach().clone() for p in params]
    fused = fuse_linears(layers)
    assert _same(params, [p for lin in layers for p in (lin.weight, lin.bias)]) and _same(params, fused.params)
    with torch.no_grad():
        params[2].mul_(2.0)  # through the old reference: the fused GEMM sees it
        values[2] *= 2.0
        x = torch.randn(3, 5)
        torch.testing.assert_close(fused_linear(x, layers, fused)[:, 6:10], x @ values[2].t() + values[3])
    fuse.release(fused)
    assert _same(params, [p for lin in layers for p in (lin.weight, lin.bias)])
    assert all(type(p) is torch.nn.Parameter and torch.equal(p, v) for p, v in zip(params, values, strict=True))
    assert len({p.untyped_storage().data_ptr() for p in params}) == len(params)  # the concatenation let go
