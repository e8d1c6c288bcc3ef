"""`python -m vdet.cli ...`, the same as `vdet ...`."""

from vdet.cli.main import main

raise SystemExit(main())
