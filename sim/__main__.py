import sys

from sim.cli.main import main

sys.exit(main())
