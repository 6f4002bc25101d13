import sys

from loadtest.openloop.cli import main

sys.exit(main())
