"""The data plane: what a step's rows travel through between the roles (TransferQueue, or memory in one
process), the prompt-group sampler, and the process environment the data plane needs. The runtime's bottom room.
"""
