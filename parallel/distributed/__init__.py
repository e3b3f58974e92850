"""What members of a distributed session share to trust each other: the secret and its signatures
(``secret``). The rest of distributed ``sequence`` mode still lives in ``parallel/dist_*.py``."""
