"""Run the supervisor: ``python -m builder.runtime.supervisor`` here; in the image this file is
``/opt/triton-builder/supervisor.py``, beside the package it imports (a directory wins over a
module of the same name), with ``drain.py`` and ``health.py``."""

import sys

if __package__:
    from .main import main
else:
    from supervisor.main import main  # type: ignore[no-redef]

sys.exit(main())
