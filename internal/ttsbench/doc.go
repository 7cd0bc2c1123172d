// Package ttsbench is `mosto bench tts`: seed 002's two experiments
// (lossy last mile, high jitter) with end-to-end TCP, mosto's transparent
// relay (TTS: the proxy's tproxy entry on the path) and mosto's explicit
// split relay (a service entry the client connects to), with CUBIC and BBR,
// reported as the seed does (mean, sd, Vargha-Delaney A12, Mann-Whitney p);
// and a grid over loss and RTT with 1, 2 and 3 segmentation points chosen
// by the loss-aware chain model (pathcomp.LossModel), next to its
// predictions. It runs in an emulated world (internal/emu, routes through
// on-path hosts) with the relays as `mosto proxy` processes; it owns the
// worlds and processes it starts and removes them. The tables' transfers
// are appended to a results file as they end (TrialsFile, one Trial per
// line), and MergeTrials pools the files of several runs into the tables,
// so the seed's 200 trials can accumulate over many short runs.
package ttsbench
