# Stdlib replacement through importlib: the digest and the file replacement the old grader trusted.
import importlib

hashlib = importlib.import_module("hashlib")
real = hashlib.sha256
hashlib.sha256 = lambda data=b"", **k: real(b"forged")
importlib.import_module("os").replace = lambda src, dst: None
