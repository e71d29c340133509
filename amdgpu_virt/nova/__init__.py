"""OpenStack Nova driver: PCI config, GIM host config, flavors, Placement."""
