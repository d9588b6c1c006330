# The tripwire's hook at the deepest recursion depth (issue 34, "How they did it" 2): near the recursion limit the
# audit hook itself overflows, and a hook that swallows its own errors lets the event through unreported. This
# recurses to the limit, then, unwinding one frame at a time, reads a frame at the deepest depth where
# sys._getframe still works. The tripwire fails closed: the read is flagged, or its error is.
import sys


def _deepest(depth, out):
    try:
        _deepest(depth + 1, out)
    except RecursionError:
        pass
    if "frame" not in out:
        try:
            out["frame"] = sys._getframe(0)
            out["depth"] = depth
        except RecursionError:
            pass
    return out


def visible_gpu_count(value, physical):
    found = _deepest(0, {})
    return -found.get("depth", 1)
