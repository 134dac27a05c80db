import sys

from pcietrace.cli import main

if __name__ == "__main__":  # guard: the sampler's spawned child re-imports the main module
    sys.exit(main())
