# the new GPU timer test must fail when the reset is taken out
import pytest
from ltxbench.bench import timing
timing.reset_persisting_l2 = lambda: None
import tests.test_bench_micro as t
try:
    t.test_gpu_timer_gives_no_provider_the_l2_lines_an_evict_last_kernel_left()
    print("CAN-FAIL CHECK: test PASSED without the reset (the test cannot catch the bias)")
except AssertionError as e:
    print("CAN-FAIL CHECK: test failed without the reset, as it must:", e)
