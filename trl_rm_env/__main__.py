"""`python -m trl_rm_env ...` runs the `trl-rm-env` command (`trl_rm_env.recipes.cli`)."""

import sys

from trl_rm_env.recipes.cli import main

sys.exit(main())
