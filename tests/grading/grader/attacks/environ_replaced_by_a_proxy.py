# os.environ replaced by a proxy (issue 34, "How they did it" 6): the old check read the variable it set through
# os.environ, which the submission had replaced. make_tf_config here writes its (wrong) answer into the
# environment and returns it; the proxy hides that write from the check, and rewrites what TensorFlow's
# TFConfigClusterResolver reads into a correct TF_CONFIG. The judge parses the returned string itself.
import json
import os

_real = os.environ


class _Environ(dict):
    """What the check sees: its own TF_CONFIG (made correct), never the one make_tf_config set."""

    shown = None

    def _fix(self, text):
        try:
            config = json.loads(text)
            config["cluster"]["worker"] = [w.replace("localhost", "127.0.0.1") for w in config["cluster"]["worker"]]
            config["task"]["index"] = int(config["task"]["index"])
            return json.dumps(config)
        except Exception:
            return text

    def get(self, key, default=None):
        if key == "TF_CONFIG":
            return default if self.shown is None else self.shown
        return _real.get(key, default)

    def __getitem__(self, key):
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __contains__(self, key):
        return self.get(key) is not None

    def __setitem__(self, key, value):
        if key == "TF_CONFIG":
            self.shown = self._fix(value)
        _real[key] = value

    def pop(self, key, *default):
        if key == "TF_CONFIG":
            self.shown = None
        return _real.pop(key, *default)


vars(os)["environ"] = _Environ()


def make_tf_config(ports, index):
    if not 0 <= index < len(ports) or len(set(ports)) != len(ports):
        raise ValueError("index out of range or a port repeated")
    text = json.dumps({"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                       "task": {"type": "worker", "index": str(index)}})
    _real["TF_CONFIG"] = text  # set where the process reads it; the proxy hides it
    return text
