import sys

from torch_mojo.doctor import main

sys.exit(main())
