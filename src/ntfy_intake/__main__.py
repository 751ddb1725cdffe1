"""`python -m ntfy_intake` runs the same CLI as the `ntfy-intake` script."""

from ntfy_intake.cli import main

raise SystemExit(main())
