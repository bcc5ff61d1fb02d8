"""Several GPUs of one host: the command under torchrun (launch.py), the guidance pair's halves on two ranks and the
video tokens over the context-parallel ranks (split.py), diffusers' context parallelism for the attention
(context.py), and which exchange runs each attention of our processors (attend.py: ours in ulysses.py, ring.py and
symmetric.py, else diffusers'). docs/parallel.md has the splits, what each costs and what was measured.

`plan.parallelize(transformer, world, plan, tokens)` applies a run's split to a transformer after the kernel injection
(so diffusers' hooks and parallel config reach the processors and forwards we installed) and returns a report whose
`revert()` takes it all off again, before the injection is reverted.
"""
