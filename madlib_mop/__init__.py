"""madlib_mop: in-database deep learning model selection for PostgreSQL.

The package is imported in two places: by PL/Python inside the server (the in-database
runtime: `madlib_mop.runtime`, `madlib_mop.plpy_bridge`) and by client tools (the embedded
cluster, the demo, the extension build).  Importing the package itself is cheap: nothing
heavy (TensorFlow) is imported until a function needs it.
"""

from madlib_mop.errors import MadlibMopError

__version__ = "0.23.0"

__all__ = ["MadlibMopError", "__version__"]
