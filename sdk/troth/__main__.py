"""`python -m troth`: the `troth` command."""

from __future__ import annotations

import sys

from troth._cli import main

sys.exit(main())
