"""The math and the wire: what crosses a pipeline boundary and how it is made small.

Pure: torch and msgpack only. No asyncio, no sockets, no DHT (docs/design.md section 2).
"""
