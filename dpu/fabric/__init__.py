"""The fabric mirror's kernel side (docs/fabric.md): FRR speaks BGP EVPN, the kernel holds a shadow."""
