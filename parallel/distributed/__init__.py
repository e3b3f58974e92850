"""What members of a distributed session share to trust each other: the secret and its signatures
(``secret``), the control messages and their checks (``protocol``), and the block descriptions a
worker builds its blocks from (``block_specs``). The rest of distributed ``sequence`` mode still
lives in ``parallel/dist_*.py``."""
