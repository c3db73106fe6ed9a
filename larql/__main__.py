from __future__ import annotations

import sys

from larql.cli import main

sys.exit(main())
