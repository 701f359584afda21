"""``python -m spark_plugin conf | pack | config-docs``: see ``spark_plugin.tools.conf_command``."""

import sys

from spark_plugin.tools.conf_command import main

if __name__ == "__main__":
    sys.exit(main())
