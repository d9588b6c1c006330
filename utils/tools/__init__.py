"""The maintainers' tools, one command each (``python -m gpucourse.<name>`` runs them through a thin shim).

* :mod:`.authoring`: build course notebooks from percent-format source, execute and store them;
* :mod:`.labgen`: generate ``labs/`` from ``solutions/``;
* :mod:`.i18n`: the Chinese edition (PO files, builds, drift) and ``check()``'s message catalogue;
* :mod:`.gpureport`: the whole course on an NVIDIA GPU, and ``gpu-report.md`` (``make test-gpu``);
* :mod:`.benchmark`: the tf.data / XLA / capstone ratio table and this machine's roofline.

They are not part of what a notebook imports, and the graded kernel's copy of the course has none of them.
"""
