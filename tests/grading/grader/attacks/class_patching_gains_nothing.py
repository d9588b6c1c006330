# Class patching (made moot by grading v2 for what is judged on plain data): methods and properties of the
# course's, Keras's and TensorFlow's classes, by assignment and through setattr. Every device compares equal
# and every eager tensor's numpy() says 42; summarise_devices and pick_device answer wrongly. The observer
# judges the plain data the kernel sent: a dict of counts and a device name.
import keras
import tensorflow as tf
from gpucourse import simulate

simulate.Workload.train = lambda self, ds, steps=None: None
simulate.Run.ratio = property(lambda self: 1.0)
keras.Model.fit = lambda self, *a, **k: None
setattr(tf.config.LogicalDevice, "__eq__", lambda self, other: True)
setattr(tf.config.PhysicalDevice, "__eq__", lambda self, other: True)
type(tf.constant(1.0)).numpy = lambda self: 42


def summarise_devices(devices):
    return {"CPU": 1}


def pick_device(devices):
    if not devices:
        raise ValueError("no devices")
    return devices[-1]
