"""``python -m mirrorkit`` runs the `mirrorkit` command."""

import sys

from mirrorkit.commands.cli import main

sys.exit(main())
