"""The contract every pybench-eval process shares.

The gateway, the executor and the grader never import each other; they meet through the schemas, queue
names, storage layout and errors defined here.
"""
