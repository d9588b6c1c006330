# Not an attack: correct answers written another way than the solution (a Counter for the summary, NumPy
# integers, a logging call, a traceback printed and a worker thread that is joined): full marks, no flag.
import collections
import logging
import threading
import traceback

import numpy as np


def summarise_devices(devices):
    return dict(collections.Counter(d.device_type for d in devices))


def visible_gpu_count(value, physical):
    if value is None:
        return np.int64(physical)
    count = 0
    for token in value.split(","):
        token = token.strip()
        if not token.isdigit() or int(token) >= physical:
            break
        count += 1
    logging.getLogger("lab01").info("visible: %d", count)
    return np.int64(count)


def cuda_versions(info):
    try:
        if not info["is_cuda_build"]:
            return None
        return {"cuda": info.get("cuda_version"), "cudnn": info.get("cudnn_version")}
    except KeyError:
        traceback.print_exc()
        raise


_done = []
_worker = threading.Thread(target=lambda: _done.append(summarise_devices([])))
_worker.start()
_worker.join()
