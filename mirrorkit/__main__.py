"""``python -m mirrorkit`` runs the `mirrorkit` command."""

import sys

from mirrorkit.cli import main

sys.exit(main())
