"""A local stand-in for AWS, for the demo and the tests: an embedded moto server and a WebSocket gateway.

Nothing here is imported by the Lambda handler or the stream consumers; it needs the ``local`` extra.
"""
