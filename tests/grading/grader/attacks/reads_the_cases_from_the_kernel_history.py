# Reading a check's cases from the kernel's own records of what it ran (made moot by grading v2): the old
# driver's cell held the items' cases, and q5's restart is meant not to know the first run's data. While the
# check calls it, this restart searches the input history (In, _ih), IPython's line cache (which holds the
# checks' kernel code) and the last cell IPython ran, and fails loudly if it finds a case there. The grader runs
# no cell holding a case: each call carries only its own arguments.
import linecache as _linecache
import re as _re

_case = _re.compile(r'"crash_at": \d|"y_restart": \[\[')  # a case's data, not code that names its keys

_solved = train_resumable


def train_resumable(strategy, model, optimizer, step_fn, dataset, steps, checkpoint_dir, save_every, preempted,
                    on_step):
    ip = get_ipython()
    texts = list(ip.user_ns.get("In", [])) + list(ip.user_ns.get("_ih", []))
    texts += ["".join(entry[2]) for entry in list(_linecache.cache.values()) if len(entry) > 2]
    info = getattr(getattr(ip, "last_execution_result", None), "info", None)
    texts.append(str(getattr(info, "raw_cell", "")))
    leaked = [t for t in texts if _case.search(t)]
    if leaked:
        raise RuntimeError(f"found the check's cases in {len(leaked)} place(s)")
    return _solved(strategy, model, optimizer, step_fn, dataset, steps, checkpoint_dir, save_every, preempted,
                   on_step)
