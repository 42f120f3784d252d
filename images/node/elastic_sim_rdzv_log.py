# Imported at start-up by every Python process in the node (elastic-sim.pth;
# not sitecustomize, which Debian's own /etc/python3.11/sitecustomize.py shadows). torch's
# rendezvous modules log through plain `logging.getLogger(__name__)`, which
# LOGLEVEL=INFO does not reach, so the lines the history needs ("The node ...
# has joined round N ... as rank R in a world of size W", keep-alive and
# closed/timeout messages) would be dropped. Give that one logger namespace an
# INFO handler on stderr; nothing else about the process changes.
import logging as _logging
import os as _os

if _os.environ.get("SIM_RDZV_LOG", "1") == "1":
    _logger = _logging.getLogger("torch.distributed.elastic.rendezvous")
    if not _logger.handlers:
        _handler = _logging.StreamHandler()
        _handler.setFormatter(_logging.Formatter("%(levelname).1s%(asctime)s %(process)d %(name)s] %(message)s"))
        _logger.addHandler(_handler)
        _logger.setLevel(_logging.INFO)
        _logger.propagate = False
