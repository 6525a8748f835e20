"""The provisioner: a network loaded onto devices (after Glow's Provisioner).

`load` takes a model or a bundle: a model is planned and each partition extracted now
(`from_model`), a bundle is read as it was compiled (`from_bundle`). Either way each
replica's programs are loaded onto devices with room (`provisioner`), or nothing stays
loaded, and the result is a frozen `LoadedNetwork` (`network`) the host then serves.
"""
