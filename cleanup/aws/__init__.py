"""The AWS call layer: every request the worker sends goes through here; it knows no action kind, fence or record.

``calls`` (the one wrapper around a boto3 method, errors translated by ``aws_errors``, answers checked by ``answers``),
``clients`` (clients made on first use, each paced), ``pacing`` and ``rate`` (timeouts, adaptive concurrency, a rate
learnt from throttling), ``permits`` (the send-time check every freeing request passes), ``retry`` (backoff bounded by
attempts and a deadline), ``coalesce`` (one request for the work of many records) and ``live_items`` (the session
table's items now under the deleted sessions' keys, read together).
"""
