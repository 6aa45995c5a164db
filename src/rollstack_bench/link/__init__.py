"""The shaped network link every networked benchmark runs through: a netns pair with tc netem
(`netem.ShapedLink`, profiles lan/dc/wan), its probe (`probe`) and the TCP relay (`proxy`)."""
