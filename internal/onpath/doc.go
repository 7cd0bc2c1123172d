// Package onpath is the controller's planner for on-path relays
// (transparent transmission segmentation, docs/tts.md): for every declared
// path (client prefixes -> relays in order -> server prefixes) it keeps an
// estimate of each hop's RTT and loss from what the relays report about
// the legs of the flows they intercept, and decides with
// pathcomp.LossModel.BestSplit which relays intercept the path's flows.
// A decision changes only when the model predicts a gain above a threshold
// and the last change is older than a hold time, so it does not flap.
package onpath
