"""`python -m blink.collect ...`: the same as `blink collect ...`."""
from .cli import main

raise SystemExit(main())
