# comment line
graph [
  directed 0
  label "tiny &amp; test"
  node [ id 0 label "London" Latitude 51.5074 Longitude -0.1278 ]
  node [
    id 1
    label "New York"
    Country "United States"
    Latitude 40.7128
    Longitude -74.0060
    extra [ nested [ deep 1 ] ]
  ]
  node [ id 2 label "Nowhere" ]
  node [ id 3 label "Boston" Latitude 42.3601 Longitude -71.0589 ]
  edge [ source 0 target 1 LinkLabel "transatlantic" ]
  edge [ source 1 target 3 ]
  edge [ source 1 target 3 ]
  edge [ source 2 target 0 ]
]
