# A fake object that claims its own properties (issue 22): it runs fn eagerly on every call and says it
# traced once and compiled with XLA. The check counts, in its own process, each time fn's Python runs.
class _Compiled:
    def __init__(self, f):
        self.f = f

    def __call__(self, x, scale, mode):
        return self.f(x, scale, mode)

    def experimental_get_tracing_count(self):
        return 1

    def experimental_get_compiler_ir(self, *args):
        return lambda stage="hlo": "HloModule fake, entry_computation_layout={(f32[5])->f32[5]}"


def compile_once(f):
    return _Compiled(f)
