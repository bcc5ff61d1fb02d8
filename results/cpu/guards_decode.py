import sys, time, logging, collections, re
import torch
sys.path.insert(0, "tests")
from test_inject_llm import build, TINY
from ltxbench.inject import llm
from transformers import StaticCache

def decode_call(model):
    cache = StaticCache(config=model.config, max_cache_len=64)
    ids = torch.randint(0, TINY["vocab_size"], (1, 8))
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, cache_position=torch.arange(8), use_cache=True)
    tok = torch.randint(0, TINY["vocab_size"], (1, 1))
    kw = dict(input_ids=tok, past_key_values=cache, cache_position=torch.tensor([8]), position_ids=torch.tensor([[8]]), use_cache=True)
    return kw

def guards(model, kw):
    lines = []
    class C(logging.Handler):
        def emit(self, r): lines.append(r.getMessage())
    h = C(); lg = logging.getLogger("torch._dynamo.guards.__guards")
    torch._dynamo.reset(); torch._logging.set_logs(guards=True); lg.addHandler(h)
    f = torch.compile(model, fullgraph=True, backend="eager")
    with torch.no_grad():
        f(**kw)
        t = []
        for _ in range(30):
            t0 = time.perf_counter(); f(**kw); t.append(time.perf_counter() - t0)
    lg.removeHandler(h); torch._logging.set_logs()
    return "\n".join(lines), sorted(t)[15]

model = build("llama", num_hidden_layers=int(sys.argv[1]) if len(sys.argv) > 1 else 32)
kw = decode_call(model)
g0, t0 = guards(model, kw)
with llm.apply_kernels(model, "reference") as rep:
    print(dict(rep.rules))
    kw = decode_call(model)
    g1, t1 = guards(model, kw)
kw = decode_call(model)
g2, t2 = guards(model, kw)
print(f"call us: orig {t0*1e6:.0f} patched {t1*1e6:.0f} orig again {t2*1e6:.0f}")
open("/tmp/g/orig.txt","w").write(g0); open("/tmp/g/patched.txt","w").write(g1)
def kinds(g):
    c = collections.Counter()
    for l in g.splitlines():
        m = re.search(r"\b([A-Z_]{4,})\b", l)
        if m: c[m.group(1)] += 1
    return c
k0, k1 = kinds(g0), kinds(g1)
for k in sorted(set(k0)|set(k1)):
    print(f"{k:35s} {k0[k]:6d} {k1[k]:6d}")
print("lines", len(g0.splitlines()), len(g1.splitlines()))
