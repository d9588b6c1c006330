# An int subclass whose __int__ runs later (issue 34, "How they did it" 4): the old check kept the object and
# converted it after it had moved on, when the subclass's methods said whatever was expected. Here every
# answer is a subclass that equals anything, with __int__/__index__/__float__/__str__ that change their
# answer after the first use: an int for q4, a dict of them for q1, a str for q2. The kernel converts each
# result to exact built-in data through the base type's own methods at once: the observer sees -1, and so on.
_uses = [0]


class _Sly(int):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = int.__hash__

    def __int__(self):
        _uses[0] += 1
        return 0 if _uses[0] == 1 else 4

    __index__ = __int__

    def __float__(self):
        return float(self.__int__())

    def __repr__(self):
        return repr(self.__int__())


class _SlyName(str):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = str.__hash__

    def __str__(self):
        return "/device:GPU:0"


def visible_gpu_count(value, physical):
    return _Sly(-1)


def summarise_devices(devices):
    return {"CPU": _Sly(-1), "GPU": _Sly(-1)}


def pick_device(devices):
    if not devices:
        raise ValueError("no devices")
    return _SlyName("nowhere")
