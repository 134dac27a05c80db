import sys

from pcietrace.cli import main

sys.exit(main())
