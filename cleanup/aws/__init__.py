"""The AWS call layer: every request the worker sends goes through here.

``calls`` (the one wrapper around a boto3 method, errors translated by ``aws_errors``), ``clients`` (clients made on
first use, each paced), ``pacing`` and ``rate`` (deadline, timeouts, adaptive concurrency, a rate learnt from
throttling), ``retry`` (backoff bounded by attempts and a deadline), and ``coalesce`` / ``batch_calls`` (one request
for the work of many records).
"""
