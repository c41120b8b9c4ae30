"""python -m serving.engine: the embedded engine with settings from the environment."""

import logging

from serving.engine.server import serve
from tracetrain.settings import load_settings

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
serve(load_settings())
