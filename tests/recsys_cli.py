"""The tools' command line as an operator runs it: `recsys ...` in a process of its own."""

from __future__ import annotations

import sys

RECSYS = [sys.executable, "-c", "import sys; from recsys_tools.cli import main; sys.exit(main())"]
