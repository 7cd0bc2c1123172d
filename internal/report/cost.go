package report

import "fmt"

// The cost of relaying, as seed 001 (the MOSTO cost estimate) states it:
// a relay VM is an EC2 m4.large (2 cores) at $0.108 an hour, three such
// relays cost $0.009 per terabit delivered, and CloudFront $0.1875 per
// terabit for requests of 500 KB. Both benchmarks that print a cost per
// delivered terabyte (bench transfer, bench proxy) use these and
// DollarsPerTB, with the price of a core-hour from their --core-hour flag.
const (
	// DefaultCoreHour is the seed's price of one CPU core for an hour.
	DefaultCoreHour = 0.108 / 2
	// SeedCloudFrontPerTb and SeedRelaysPerTb are the seed's dollars per
	// terabit (x 8 per terabyte).
	SeedCloudFrontPerTb = 0.1875
	SeedRelaysPerTb     = 0.009
)

// DollarsPerTB returns the processor cost in dollars of delivering a
// terabyte (10^12 bytes) when relaying a gigabyte (10^9 bytes) takes
// cpuSecondsPerGB seconds of CPU, at price dollars per core-hour.
func DollarsPerTB(cpuSecondsPerGB, price float64) float64 {
	return cpuSecondsPerGB * 1000 / 3600 * price
}

// SeedCostNote is the seed's figures in the units of DollarsPerTB, for a
// report's legend.
func SeedCostNote() string {
	return fmt.Sprintf("seed 001: CloudFront $%.4g/Tb = $%.2f/TB at 500 KB per request, three relay VMs $%.3g/Tb = $%.3f/TB",
		SeedCloudFrontPerTb, 8*SeedCloudFrontPerTb, SeedRelaysPerTb, 8*SeedRelaysPerTb)
}
