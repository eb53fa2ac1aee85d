"""What operators run around the worker: the preflight of an account (``preflight``), records read back from files
(``sources``, for replay), and the redrive of failed batches and dead-lettered records (``redrive``,
``claim_check``)."""
