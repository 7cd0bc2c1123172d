package scenario

// cityCoords are the coordinates (degrees) of the WonderProxy cities the
// emulated worlds use, for ControllerConfig.Coordinates (the dataset
// carries RTTs only).
var cityCoords = map[string][2]float64{
	"Dublin": {53.35, -6.26}, "London": {51.51, -0.13}, "Amsterdam": {52.37, 4.90}, "Frankfurt": {50.11, 8.68},
	"Paris": {48.86, 2.35}, "Madrid": {40.42, -3.70}, "Stockholm": {59.33, 18.07}, "Moscow": {55.76, 37.62},
	"NewYork": {40.71, -74.01}, "Washington": {38.91, -77.04}, "Chicago": {41.88, -87.63}, "Dallas": {32.78, -96.80},
	"Denver": {39.74, -104.99}, "SaltLakeCity": {40.76, -111.89}, "SanFrancisco": {37.77, -122.42}, "SanJose": {37.34, -121.89},
	"LosAngeles": {34.05, -118.24}, "Seattle": {47.61, -122.33}, "Toronto": {43.65, -79.38}, "Miami": {25.76, -80.19},
	"Tokyo": {35.68, 139.69}, "Singapore": {1.35, 103.82}, "Sydney": {-33.87, 151.21}, "SaoPaulo": {-23.55, -46.63},
}
