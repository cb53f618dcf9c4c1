"""``python -m homer_integrations.cli``: the same as ``homer-qa``."""

import sys

from homer_integrations.cli import main

sys.exit(main())
