"""The entry point torchcomms imports to find its `mojo` backend."""

from torch_mojo.torchcomms import register

register()
