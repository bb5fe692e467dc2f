"""``hami demo``: a whole local cluster with simulated GPU nodes (see ``hami.demo.cli``)."""
