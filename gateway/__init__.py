"""The stateless gateway: KServe v2 HTTP endpoints, validation, and the Redis queue client.

Never imports torch, tensorflow or onnxruntime; holds no per-model state that is not also in
Redis (its registry is a read-through cache of the Redis registry).
"""
