# A profiler installed by library code (issue 34, "How they did it" 3): profile.Profile.runcall installs its
# profiler from the standard library's own frames, which the old guard trusted. fast_pipeline stays sequential
# (too slow) but gives its dataset a class whose iterator runs each next() under runcall; the profiler is
# handed the frames of that call, walks up to the check's draining loop and rewrites the delivery times it has
# recorded, in place, to those of a pipeline that keeps the accelerator busy. The tripwire flags a profiler
# whoever installs it. Since the delivery times are stamped by the check's step, a callback on the grader's
# clock, there is nothing in the kernel to rewrite: the pipeline fails as the sequential pipeline it is.
import profile


class _Rewriter(profile.Profile):
    def __init__(self):
        super().__init__()
        self.dispatcher = self.rewrite

    def rewrite(self, frame, event, arg):
        while frame is not None:
            names = frame.f_locals
            got = names.get("got")
            if isinstance(got, list) and "values" in names and got:
                for i in range(1, len(got)):
                    got[i] = got[0] + 0.019 * i
                break
            frame = frame.f_back
        return 0


class _Next:
    def __init__(self, it):
        self.it = it

    def __iter__(self):
        return self

    def __next__(self):
        return _Rewriter().runcall(self.it.__next__)


def fast_pipeline(source, load, augment):
    ds = source.map(load).map(augment)

    class _Watched(type(ds)):
        def __iter__(self):
            return _Next(super().__iter__())

    ds.__class__ = _Watched
    return ds
