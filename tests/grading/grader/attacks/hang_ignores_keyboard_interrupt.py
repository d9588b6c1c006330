# A hang (issue 34): on the solved lab, visible_gpu_count retries forever, and its bare `except:` (a classic
# beginner's retry loop) swallows the interrupt the grader sends when the item's time is up. The item fails
# with a reason, the kernel is started again, and q5, graded after it, keeps its marks. Nothing here touched
# the tripwire: no review flag.
import time


def visible_gpu_count(value, physical):
    while True:
        try:
            time.sleep(0.05)
            raise ConnectionError("the device list is not ready yet")
        except:  # noqa: E722
            continue
