"""LAN discovery: the daemon announces itself over mDNS (``announcer``, loaded only with mDNS on); apps
find boxes with appliance.client, which defines the service types both sides use."""
