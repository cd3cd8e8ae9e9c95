"""The formats the learner side and the robot side share: the bundle's metadata schema, the chunk
queue that executes an action chunk, and the robot's transition ring and version files.

Both sides import this package and neither imports the other; it may use only `configs` and
`hardware`, and loads without MuJoCo, torch, onnxruntime or JAX.
"""
